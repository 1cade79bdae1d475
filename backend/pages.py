"""The browser pages: one table of pages and the one layout (head, top bar, navigation, scripts) they share.

A page's own file under frontend/ holds only its <main> element; everything around it is written here once.
Adding a page is one `Page` entry plus its body file and script; app.py routes every entry of `PAGES`."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

ICON = "favicon.svg"  # under frontend/static; /favicon.ico serves favicon.ico next to it


@dataclass(frozen=True)
class Page:
    """One page: where it is served, the file with its <main>, and what the layout puts around it."""

    path: str  # the route, Starlette syntax ("/jobs/{job_id:int}")
    body: str  # the file under frontend/ that holds the page's <main>
    title: str  # after "detlab · " in the window title
    scripts: tuple[str, ...]  # under /static/, in order, after the shared common.js (see `shared`)
    tagline: str = ""  # beside the brand in the top bar
    nav: str = ""  # the page's own link text in the navigation; "" for none
    section: str = ""  # the navigation link marked as current on this page (its own by default)
    plotly: bool = False  # the page draws charts: plotly.min.js loads before its scripts
    shared: bool = True  # common.js (helpers, API client, the logged-in user) before its scripts
    public: bool = False  # served without an identity when auth is on (the login page)
    navigation: bool = True  # the top bar shows the navigation


# The order of the navigation is the order of the entries that have a `nav` text.
PAGES: tuple[Page, ...] = (
    Page("/jobs", "jobs.html", "jobs", ("jobs.js",), tagline="every experiment, its verdict, its tags", nav="jobs"),
    Page("/", "index.html", "new comparison", ("diagnosis_form.js", "index.js"),
         tagline="where do two training runs first part?", nav="new job"),
    Page("/compare", "compare.html", "compare runs", ("compare.js",), tagline="any two runs, bit for bit",
         nav="compare runs", plotly=True),
    Page("/findings", "findings.html", "findings", ("findings.js",),
         tagline="configs vs reproducibility, across hardware and libraries", nav="findings"),
    Page("/jobs/{job_id:int}", "job.html", "job", ("job.js", "train.js", "collective.js", "diagnosis.js", "bisect.js",
                                                      "fix.js", "recording.js", "resume.js"),
         section="jobs", plotly=True),
    Page("/login", "login.html", "log in", ("login.js",), tagline="where do two training runs first part?",
         shared=False, public=True, navigation=False),
)

LAYOUT = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>detlab · {title}</title>
  <link rel="icon" type="image/svg+xml" href="/static/{icon}">
  <link rel="stylesheet" href="/static/app.css">
</head>
<body>
  <header class="topbar">
    <div class="container">
      <a class="brand" href="/">detlab</a>{tagline}{nav}
    </div>
  </header>

{body}
{scripts}
</body>
</html>
"""


def navigation(current: str) -> str:
    """The links of every page that has a `nav` text, the one named `current` marked as the page shown."""
    links = []
    for page in PAGES:
        if page.nav:
            marked = ' aria-current="page"' if page.nav == current else ""
            links.append(f'<a class="navlink" href="{escape(page.path)}"{marked}>{escape(page.nav)}</a>')
    return "".join(links)


def render(page: Page, body: str) -> str:
    """The page's HTML: the shared layout around `body` (the page's <main>), then its scripts in order."""
    tagline = f'\n      <span class="tagline">{escape(page.tagline)}</span>' if page.tagline else ""
    nav = ""
    if page.navigation:
        links = navigation(page.section or page.nav)
        nav = f'\n      <nav id="site-nav" class="site-nav" aria-label="pages">{links}</nav>'
    scripts = (("plotly.min.js",) if page.plotly else ()) + (("common.js",) if page.shared else ()) + page.scripts
    tags = "\n".join(f'  <script src="/static/{escape(name)}"></script>' for name in scripts)
    return LAYOUT.format(title=escape(page.title), icon=ICON, tagline=tagline, nav=nav,
                         body=body.strip("\n"), scripts=tags)
