"""The write path's SQL and psycopg: named queries, connections, the unit of work, the event log
(append and read), the codec, the hash chain and checkpoints. The only package that opens cursors."""
