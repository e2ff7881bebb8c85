"""What the CLI's commands share: workload options, exit codes, scripts, pictures."""
