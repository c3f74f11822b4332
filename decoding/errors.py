"""One exception for every problem a user can cause, so the CLI and the app can show its message."""


class DecodingError(ValueError):
    """Bad input or an unsupported model: the message says what is wrong and what to do."""
