"""Prompts: the prompt sets and the chat template that turns them into token ids."""
