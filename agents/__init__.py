"""Client SDK (episode lifecycle, publishing, OpenAI client factory, heartbeats) and default tasks."""

from swarmrl.agents.sdk import Episode, SwarmClient, SwarmError, default_code_version
from swarmrl.agents.sync import SyncEpisode, SyncSwarmClient

__all__ = ["Episode", "SwarmClient", "SwarmError", "SyncEpisode", "SyncSwarmClient", "default_code_version"]
