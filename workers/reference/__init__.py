"""The frozen reference policy (KL anchor)."""
