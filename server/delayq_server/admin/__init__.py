"""Queue administration (issue 14): the logic behind AdminService's queue RPCs and the dashboard."""
