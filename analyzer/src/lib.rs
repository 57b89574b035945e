//! The CCL-D analyzer: wire format, ingest, slow/hang detection, root-cause location,
//! sharding, query API and the `ccld` command line.
