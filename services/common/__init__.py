"""Pieces every service shares: NATS connection, stream/KV setup, dead-lettering, pull loops."""
