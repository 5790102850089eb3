#!/usr/bin/env python3
"""Rewrites the line anchors of docs/TOUR.md's code links to the current line of each
named definition (see scripts/tour_links.py), adding the anchor where a link has none.

    python3 scripts/update_tour_links.py          # rewrite docs/TOUR.md
    python3 scripts/update_tour_links.py --check  # only say whether it is up to date

Run it after code moves; tests/test_tour.py fails while an anchor is stale. A link whose
identifier is not defined where it points is left as it is and reported (exit status 1):
that needs a human, not a new line number."""

import argparse
import os
import sys

import tour_links

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOUR = os.path.join(REPO, "docs", "TOUR.md")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when an anchor would change")
    args = parser.parse_args()
    with open(TOUR, encoding="utf-8") as f:
        text = f.read()
    updated, changed, broken = tour_links.update_anchors(text, os.path.dirname(TOUR))
    for problem in broken:
        print(f"not defined where it points: {problem}", file=sys.stderr)
    if args.check:
        print(f"{changed} line anchors out of date" if changed else "line anchors up to date")
        return 1 if changed or broken else 0
    if changed:
        temporary = TOUR + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(updated)
        os.replace(temporary, TOUR)
    print(f"docs/TOUR.md: {changed} line anchors rewritten")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
