"""The OpenAI-compatible gateway in front of the precision tiers: ``create_app``
(gateway/app.py) over a ``GatewayConfig`` (gateway/config.py). Nothing is imported here, so
that importing one of its pure modules (the SSE reader, say) does not build the app's whole
import graph (measure/ reads gateway's readers while the gateway's measurements run measure/)."""
