"""The run directory: its names, records, path safety, writer, reader, lock and run.json's types."""
