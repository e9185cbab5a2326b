"""Developer tooling: local Kafka broker and workload helpers; never imported by the library itself."""
