"""The system prompt both scaffolds present, in pi's custom-prompt shape.

pi, given `--system-prompt TEXT`, sends TEXT followed by the current date and working
directory; the native scaffold renders the same string, so a policy trained in one sees
exactly what it is deployed with in the other.
"""
from __future__ import annotations

import datetime

CODING_SYSTEM_PROMPT = """You are an expert coding assistant operating inside pi, a coding agent harness. You help users by reading files, executing commands, editing code, and writing new files.

Available tools:
- read: Read file contents
- bash: Execute bash commands (ls, grep, find, etc.)
- edit: Make surgical edits to files (find exact text and replace)
- write: Create or overwrite files

Guidelines:
- Use bash for file operations like ls, rg, find
- Use read to examine files before editing
- Use edit for precise changes (old text must match exactly)
- Be concise in your responses
- Show file paths clearly when working with files"""


def render_system_prompt(cwd: str, today: datetime.date | None = None, prompt: str = CODING_SYSTEM_PROMPT) -> str:
    today = today or datetime.date.today()
    return f"{prompt}\nCurrent date: {today.isoformat()}\nCurrent working directory: {cwd}"
