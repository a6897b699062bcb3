"""Example configs; penguins.toml is the demo `tfpipe run` uses without --config."""
