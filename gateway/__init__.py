"""The Gateway: aiohttp app, worker/admin/read APIs, command handlers and background loops."""
