"""analysis.py - monthly sales totals from sales.xlsx, and a chart of the trend."""
import matplotlib.pyplot as plt
import pandas as pd

df = pd.read_excel("sales.xlsx", sheet_name="Sales", parse_dates=["date"])
df["revenue"] = df["units"] * df["unit_price"]
monthly = df.groupby(df["date"].dt.to_period("M")).agg(units=("units", "sum"),
                                                        revenue=("revenue", "sum"))

print("Monthly totals, %d sales rows" % len(df))
print(monthly.to_string(float_format=lambda v: "%.2f" % v))
best = monthly["revenue"].idxmax()
print("\nBest month: %s (%.2f)" % (best, monthly.loc[best, "revenue"]))
print("Year total: %.2f" % monthly["revenue"].sum())

fig, ax = plt.subplots(figsize=(8, 4.5))
ax.plot(monthly.index.astype(str), monthly["revenue"], marker="o")
ax.set_title("Monthly revenue, 2025")
ax.set_xlabel("month")
ax.set_ylabel("revenue")
ax.grid(True, alpha=0.3)
fig.autofmt_xdate()
fig.tight_layout()
fig.savefig("monthly_trend.png", dpi=100)
print("saved monthly_trend.png")
