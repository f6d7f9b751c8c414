"""``gateway`` with storage writes going through a ``FaultyOS`` whose rules are in ``$POLYGATE_FAULTS``.

Started by ``FaultyGateway`` in the tests; the rules file may change while it runs.
"""

import os
import sys

from faultyos import FaultyOS

from gateway.cli.main import main
from gateway.storage import fileio

if __name__ == "__main__":
    fileio.system = FaultyOS.controlled_by(os.environ["POLYGATE_FAULTS"])
    sys.argv[0] = "gateway"
    main()
