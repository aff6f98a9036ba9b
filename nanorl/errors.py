"""The errors nanorl raises on purpose, each meaning "stop and tell the user in one line" (cli.py prints them as
`nanorl: error: ...`). This module imports nothing of nanorl, so every other module may import it."""


class ConfigError(ValueError):
    """A config value that cannot work, named by its key; raised before any model is loaded."""


class RewardSetupError(RuntimeError):
    """A reward that fails for a reason that is not the sample (its signature, an import, a missing column):
    it stops the run whatever `reward_errors` says."""
