#!/usr/bin/env python3
"""Orders with a transactional outbox on PostgreSQL, from Python (psycopg2).

Each order row and its effect commit in ONE transaction: the effect is
written by the store's function jsd_emit(owner, id, subject, payload,
headers, not_before, order_key), which returns the effect's Nats-Msg-Id and
wakes `jsdurable relay` at commit. A rolled-back transaction publishes
nothing. The outbox is a SQL contract (docs/SQL-CONTRACT.md):

    jsdurable migrate --store 'postgres://app@db/app'
    python3 examples/python/orders_pg.py 'postgres://app@db/app' public orders.created 10
    jsdurable relay --store 'postgres://app@db/app' --until-idle

The effect of order i: owner "order-<i>", id "created", payload
{"order_id":<i>}, header X-Trace: trace-<i>. Prints "<i> <msg id>" per order.
"""
import json
import sys

import psycopg2
from psycopg2 import errors, sql


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: orders_pg.py DSN SCHEMA SUBJECT COUNT")
    dsn, schema, subject, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    conn = psycopg2.connect(dsn)
    emit = sql.SQL("SELECT {}.jsd_emit(%s, %s, %s, %s, %s)").format(sql.Identifier(schema))
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT)")
    for i in range(1, count + 1):
        payload = json.dumps({"order_id": i}, separators=(",", ":")).encode()
        with conn, conn.cursor() as cur:  # one transaction: COMMIT at the end of the block
            cur.execute("INSERT INTO orders(id, status) VALUES (%s, 'placed')", (i,))
            cur.execute(emit, (f"order-{i}", "created", subject, psycopg2.Binary(payload),
                               json.dumps({"X-Trace": f"trace-{i}"})))
            print(i, cur.fetchone()[0])
    # Rolled back: never published.
    try:
        with conn, conn.cursor() as cur:
            cur.execute(emit, ("order-rejected", "created", subject, psycopg2.Binary(b"x"), None))
            raise ValueError("card declined")
    except ValueError as e:
        print(f"rolled back order rejected ({e})")
    # The same identity twice is refused, as jsd_tx_emit refuses it.
    try:
        with conn, conn.cursor() as cur:
            cur.execute(emit, ("order-1", "created", subject, psycopg2.Binary(b"again"), None))
    except errors.UniqueViolation as e:
        print(f"refused: {e.pgerror.splitlines()[0]}")
    conn.close()


if __name__ == "__main__":
    main()
