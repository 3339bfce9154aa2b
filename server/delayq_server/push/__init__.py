"""Push delivery: due jobs POSTed to admin-configured HTTP targets (README "Push delivery")."""
