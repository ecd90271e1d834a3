"""The Parquet rollout pool: schema, streaming writer, reader, validation and summary."""
