//! Conversion of janus-core errors into Python exceptions (the only place that does it).
