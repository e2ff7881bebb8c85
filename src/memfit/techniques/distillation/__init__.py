"""Knowledge distillation: the config and handler, and its trace."""
