"""The command line around LightningCLI: shorthand flags, default subcommand, one-line errors and exit codes."""
