"""skipsearch: find which transformer layers a self-speculative draft should skip."""

__version__ = "0.1.0"
