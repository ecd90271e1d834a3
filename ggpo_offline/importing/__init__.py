"""Rollouts other tools wrote (RL frameworks, a vLLM server, a generic record), imported as a pool."""
