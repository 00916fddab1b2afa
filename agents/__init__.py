"""Client SDK (episode lifecycle, publishing, OpenAI client factory, heartbeats) and default tasks."""

# The names below are the package's API (re-exported: `from swarmrl.agents import SwarmClient`).
from swarmrl.agents.sdk import Episode, SwarmClient, SwarmError, default_code_version, describe
from swarmrl.agents.sync import SyncEpisode, SyncSwarmClient
from swarmrl.infra.credentials import AgentCredential
