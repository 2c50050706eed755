"""A FastMCP server, as people write them: ``ctx.elicit`` with a pydantic
model, whose schema carries what pydantic writes (``exclusiveMinimum`` for
``gt``, ``multipleOf``, ``const`` for a one-value ``Literal``, a ``default``
on every field, enums inlined). FastMCP refuses to elicit on 2026-07-28
connections.

``python -m tests.fastmcp_kit`` serves it over stdio; :func:`build` gives it
for streamable HTTP (``build().http_app()``).
"""

from __future__ import annotations

import enum
import json
from typing import Literal

from fastmcp import Context, FastMCP
from pydantic import BaseModel, Field


class Seat(enum.Enum):
    WINDOW = "window"
    AISLE = "aisle"


class Booking(BaseModel):
    party: int = Field(gt=0, lt=13, description="How many people")
    budget: float = Field(default=50.0, ge=0, multiple_of=0.5, description="Budget per person")
    agree: Literal["yes"] = Field(default="yes", description="You agree to the house rules")
    seat: Seat = Seat.AISLE
    meal: Literal["lunch", "dinner"] = "dinner"
    vegetarian: bool = False
    notes: str = ""


def build(name: str = "tables") -> FastMCP:
    mcp = FastMCP(name)

    @mcp.tool
    async def book(restaurant: str, ctx: Context) -> str:
        """Book a table; asks for the details."""
        answer = await ctx.elicit(f"Booking at {restaurant}", Booking)
        if answer.action != "accept":
            return f"no booking ({answer.action})"
        data = answer.data.model_dump(mode="json")
        return json.dumps({k: [type(v).__name__, v] for k, v in data.items()})

    return mcp


if __name__ == "__main__":
    build().run("stdio", show_banner=False)
