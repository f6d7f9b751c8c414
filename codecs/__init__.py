"""Built-in codecs, one package per protocol. Imported as ``gateway.codecs``."""
