"""A client of `toolscript serve --http`: the Python MCP SDK's Streamable HTTP client, driven by
tests/it/mcp_http.rs.

Usage: client.py URL PLAN, PLAN a JSON array of steps run in order on one session:
  {"op": "list_tools"}
  {"op": "call", "tool": NAME, "args": {...}, "progress": true}   # progress: pass a callback
  {"op": "concurrent", "tool": NAME, "calls": [{...}, ...]}       # all at once, one session
  {"op": "wait"}                                                  # until a line on stdin
Prints one JSON object per line: {"step": I, "result": ...} or {"step": I, "error": ...}, and
{"step": I, "event": "progress", ...} as progress notifications arrive. Exits 0 once every step
has run, whatever the steps answered: the Rust test judges the answers.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def emit(obj):
    print(json.dumps(obj), flush=True)


def result_json(res):
    return {
        "is_error": bool(res.is_error),
        "structured": res.structured_content,
        "text": [c.text for c in res.content if getattr(c, "type", None) == "text"],
    }


def error_json(e):
    if isinstance(e, MCPError):
        return {"type": "MCPError", "code": e.code, "message": str(e)}
    return {"type": type(e).__name__, "message": str(e)}


async def run_step(session, index, step):
    op = step["op"]
    if op == "list_tools":
        tools = await session.list_tools()
        return {"tools": [t.model_dump(by_alias=True, exclude_none=True) for t in tools.tools]}
    if op == "call":
        callback = None
        if step.get("progress"):

            async def callback(progress, total, message):
                emit({"step": index, "event": "progress", "progress": progress, "message": message})

        res = await session.call_tool(step["tool"], step.get("args"), progress_callback=callback)
        return result_json(res)
    if op == "concurrent":
        results = await asyncio.gather(
            *(session.call_tool(step["tool"], args) for args in step["calls"]),
            return_exceptions=True,
        )
        return [
            {"error": error_json(r)} if isinstance(r, BaseException) else result_json(r)
            for r in results
        ]
    if op == "wait":
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        return None
    raise ValueError(f"unknown op {op!r}")


async def main(url, plan):
    async with streamable_http_client(url) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            init = await session.initialize()
            emit({"step": -1, "result": {"server": init.server_info.name}})
            for index, step in enumerate(plan):
                try:
                    emit({"step": index, "result": await run_step(session, index, step)})
                except Exception as e:  # the test asserts on what failed, and how
                    emit({"step": index, "error": error_json(e)})


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
