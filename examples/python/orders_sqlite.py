#!/usr/bin/env python3
"""Orders with a transactional outbox, from Python's standard sqlite3 module.

Each order row and the effect announcing it commit in ONE transaction of the
application's own connection: `jsdurable relay` (running beside it) publishes
the effect to JetStream exactly once after the commit, and never if the
transaction rolls back. No jsdurable code is linked: the outbox is a SQL
contract (docs/SQL-CONTRACT.md). Create the tables first:

    jsdurable migrate --store sqlite:orders.db
    python3 examples/python/orders_sqlite.py orders.db orders.created 10
    jsdurable relay --store sqlite:orders.db --until-idle

The effect of order i: owner "order-<i>", id "created", payload
{"order_id":<i>}, header X-Trace: trace-<i>. Order "rejected" is rolled back
to show that nothing of it is published.
"""
import json
import sqlite3
import sys


def place_order(db, order_id, subject):
    """The order row and its effect, in one transaction (the `with` block)."""
    payload = json.dumps({"order_id": order_id}, separators=(",", ":")).encode()
    with db:  # BEGIN ... COMMIT, or ROLLBACK on an exception
        db.execute("INSERT INTO orders(id, status) VALUES (?, 'placed')", (order_id,))
        # the minimal write is INSERT INTO jsd_outbox(owner, effect_id, subject, payload);
        # headers_json is optional; msg_id and the timestamps are filled in for us
        db.execute(
            "INSERT INTO jsd_outbox(owner, effect_id, subject, payload, headers_json) "
            "VALUES (?, ?, ?, ?, ?)",
            (f"order-{order_id}", "created", subject, payload,
             json.dumps({"X-Trace": f"trace-{order_id}"})),
        )


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: orders_sqlite.py DB_PATH SUBJECT COUNT")
    path, subject, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    db = sqlite3.connect(path, isolation_level="DEFERRED")
    db.execute("PRAGMA busy_timeout = 5000")  # the relay writes the same file
    with db:
        db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT)")
    for i in range(1, count + 1):
        place_order(db, i, subject)
        print(f"committed order {i}")
    # A transaction that fails after writing its effect: rolled back, never published.
    try:
        with db:
            db.execute("INSERT INTO jsd_outbox(owner, effect_id, subject, payload) "
                       "VALUES ('order-rejected', 'created', ?, x'00')", (subject,))
            raise ValueError("card declined")
    except ValueError as e:
        print(f"rolled back order rejected ({e})")
    # The database refuses what the relay could never publish, naming the rule.
    try:
        with db:
            db.execute("INSERT INTO jsd_outbox(owner, effect_id, subject, payload) "
                       "VALUES ('order-bad', 'created', 'orders.*', x'00')")
    except sqlite3.IntegrityError as e:
        print(f"refused: {e}")
    db.close()


if __name__ == "__main__":
    main()
