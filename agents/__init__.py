"""Client SDK (episode lifecycle, publishing, OpenAI client factory, heartbeats) and default tasks."""

from swarmrl.agents.sdk import Episode, SwarmClient, SwarmError, default_code_version, describe
from swarmrl.agents.sync import SyncEpisode, SyncSwarmClient
from swarmrl.infra.credentials import AgentCredential

__all__ = [
    "AgentCredential",
    "Episode",
    "SwarmClient",
    "SwarmError",
    "SyncEpisode",
    "SyncSwarmClient",
    "default_code_version",
    "describe",
]
