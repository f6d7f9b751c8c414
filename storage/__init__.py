"""The storage engine (imported as ``gateway.storage``): segments, index, journal, groups."""
