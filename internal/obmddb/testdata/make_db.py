"""Builds obmd-style SQLite databases for obmddb's tests.

usage: make_db.py OUT KIND
KIND: small | many | overflow | page512 | page65536 | empty | nonodes | wal
"""
import json
import sqlite3
import sys

out, kind = sys.argv[1], sys.argv[2]
conn = sqlite3.connect(out)
if kind == "page512":
    conn.execute("PRAGMA page_size=512")
if kind == "page65536":
    conn.execute("PRAGMA page_size=65536")
if kind == "wal":
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
if kind != "nonodes":
    # obmd's schema, exactly.
    conn.execute("CREATE TABLE IF NOT EXISTS nodes (label VARCHAR(80) PRIMARY KEY, obm_info TEXT NOT NULL)")
else:
    conn.execute("CREATE TABLE other (x TEXT)")


def put(label, info):
    conn.execute("INSERT INTO nodes(label, obm_info) VALUES (?, ?)", (label, json.dumps(info)))


if kind in ("small", "page512", "page65536", "wal"):
    put("node-1", {"type": "mock", "info": {"addr": "10.0.0.1", "NumWrites": 42}})
    put("node 2", {"type": "ipmi", "info": {"addr": "10.0.0.2", "user": "admin", "pass": "s3cret"}})
    put("node-3", {"type": "dummy", "info": {"addr": "127.0.0.1:9"}})
if kind in ("many", "page512"):
    for i in range(3000 if kind == "many" else 300):
        put("bulk-%05d" % i, {"type": "mock", "info": {"addr": "10.1.%d.%d" % (i // 250, i % 250)}})
if kind == "overflow":
    put("big", {"type": "mock", "info": {"addr": "x" * 200000}})
    put("after-big", {"type": "mock", "info": {"addr": "y"}})
conn.commit()
if kind == "wal":
    # Keep the log unmerged: leave without checkpointing.
    import os
    os._exit(0)
conn.close()
