"""make_workbook.py - writes sales.xlsx: a year of sales rows (date, region, product, units,
unit price), deterministic, with openpyxl."""
import datetime
import random
import sys

from openpyxl import Workbook

out = sys.argv[1] if len(sys.argv) > 1 else "sales.xlsx"
rng = random.Random(2026)
products = {"Widget": 19.5, "Gadget": 42.0, "Gizmo": 7.25, "Doohickey": 99.0}
regions = ["North", "South", "East", "West"]

wb = Workbook()
ws = wb.active
ws.title = "Sales"
ws.append(["date", "region", "product", "units", "unit_price"])
day = datetime.date(2025, 1, 1)
while day.year == 2025:
    season = 1.0 + 0.5 * (day.month in (11, 12)) - 0.2 * (day.month in (1, 2))
    for _ in range(rng.randint(2, 6)):
        product = rng.choice(list(products))
        units = max(1, int(rng.gauss(12, 5) * season))
        ws.append([day, rng.choice(regions), product, units, products[product]])
    day += datetime.timedelta(days=1)
wb.save(out)
print("wrote %s (%d rows)" % (out, ws.max_row - 1))
