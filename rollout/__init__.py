"""The rollout stage: which version of a model serves. The last step of `tfpipe run` decides
whether a new version that passed the export's offline gate goes live, after load-testing it
beside the served one (`job.py`); `tfpipe promote`, `rollback` and `history` change and show it
by hand (`commands.py`)."""
