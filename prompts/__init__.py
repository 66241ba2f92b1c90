"""Shipped prompt sets and system prompts (data only)."""
