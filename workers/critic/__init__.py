"""The PPO critic (value model) for GAE advantages."""
