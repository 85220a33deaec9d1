"""Recipe resolution: data in, plan out (recipes/ -> catalog -> selection -> resolve -> plan). Each module's job:
docs/layout.md."""
