"""The one transport seam to the tiers: ``client.Upstream`` over httpx and the aiohttp transport
under it; every fault translated into the gateway's errors in one place.

See gateway/request/__init__.py for the order of the sub-packages."""
