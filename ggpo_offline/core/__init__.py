"""The small shared core every stage stands on: errors, model folders, settings, tracking."""
