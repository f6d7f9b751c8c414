"""The storage engine (imported as ``gateway.storage``): segments, index, journal, and the group records it is given."""
