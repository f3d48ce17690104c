#!/usr/bin/env python3
"""Keeps README.md's table of the driver surface equal to the one tools/gen_driver_api.py generates.

  readme_surface.py --generated BUILD/generated/surface.md --readme README.md            check (the test)
  readme_surface.py --generated BUILD/generated/surface.md --readme README.md --update   rewrite the README's copy

The README's copy sits between the lines `<!-- surface:begin -->` and `<!-- surface:end -->`.
"""
import argparse
import sys

BEGIN, END = '<!-- surface:begin -->', '<!-- surface:end -->'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--generated', required=True)
    ap.add_argument('--readme', required=True)
    ap.add_argument('--update', action='store_true')
    a = ap.parse_args()
    table = open(a.generated).read().strip('\n')
    readme = open(a.readme).read()
    if BEGIN not in readme or END not in readme:
        sys.exit(f'readme_surface: {a.readme} has no {BEGIN} ... {END} block')
    head, rest = readme.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    if current.strip('\n') == table:
        return
    if a.update:
        open(a.readme, 'w').write(f'{head}{BEGIN}\n{table}\n{END}{tail}')
        print(f'readme_surface: {a.readme} updated')
        return
    sys.exit(f'readme_surface: the driver-surface table in {a.readme} is out of date; the spec now gives:\n{table}\n'
             f'(update it: tools/readme_surface.py --generated {a.generated} --readme {a.readme} --update)')


if __name__ == '__main__':
    main()
