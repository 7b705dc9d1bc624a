# The restore benchmark's app (benches/app_image.sh): a service that is slow to boot for
# real reasons. It imports the image's Python stack, builds an in-memory search index of
# generated documents (a TF-IDF matrix, a frame of their attributes, per-category
# statistics and a dict from key to row), then serves two requests:
# - GET /doc/KEY: one document's row (its price, category, embedding and TF-IDF terms),
#   what a request to a search service reads: a few pages of a big heap;
# - GET /: a checksum of the whole index, which reads all of it.
# Both answers are the same on every boot and after every restore, so an answer proves
# what it read is there. Usage: serve.py PORT full|small (small: the smoke image's
# stdlib-only variant).
import gc, hashlib, http.server, os, sys, time

started = time.time()
# One BLAS thread: a multi-threaded SVD may sum in another order from run to run, and
# the checksum must be the same on every boot.
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
port, mode = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, "/opt/app/site-packages")


def words(rng, count):
    letters = list("abcdefghijklmnopqrstuvwxyz")
    return ["".join(rng.choice(letters, size=int(n))) for n in rng.integers(3, 10, count)]


if mode == "full":
    import numpy as np, pandas as pd, scipy.sparse, scipy.stats
    import sklearn.decomposition, sklearn.feature_extraction.text, sklearn.linear_model, pyarrow, matplotlib, sympy

    rng = np.random.default_rng(29)
    vocabulary = words(rng, 20000)
    rows = 400_000
    picks = rng.zipf(1.3, size=(rows, 12)) % len(vocabulary)
    docs = [" ".join([vocabulary[j] for j in r]) for r in picks.tolist()]
    tfidf = sklearn.feature_extraction.text.TfidfVectorizer().fit_transform(docs).tocsr()
    frame = pd.DataFrame({
        "key": [f"doc-{i:07d}" for i in range(rows)],
        "category": rng.integers(0, 1000, rows),
        "price": rng.lognormal(3, 1, rows),
        "length": [len(d) for d in docs],
    }).sort_values(["category", "price"], kind="stable")
    # Document embeddings (latent semantic analysis), float32 like a vector index's.
    embeddings = sklearn.decomposition.TruncatedSVD(24, n_iter=4, random_state=29).fit_transform(tfidf).astype(np.float32)
    stats = frame.groupby("category")["price"].agg(["mean", "std", "count"])
    model = sklearn.linear_model.LinearRegression().fit(frame[["length"]], frame["price"])
    by_key = dict(zip(frame["key"], range(rows)))
    arrays = [np.ascontiguousarray(a) for a in (
        tfidf.data, tfidf.indices, tfidf.indptr, embeddings, frame["price"].to_numpy(),
        frame["category"].to_numpy(), stats.to_numpy(), model.coef_)]
    data, _, indptr, embeddings, price, category = arrays[:6]
    del picks, docs

    def lookup(key):
        row = by_key[key]
        terms = data[indptr[row]:indptr[row + 1]]
        return (f"{key} {row} {price[row]:.6f} {category[row]} {float(embeddings[row].sum()):.6f} "
                f"{len(terms)} {float(terms.sum()):.6f}")
else:
    import random, benchpkg

    rng = random.Random(29)
    rows = 60_000
    blob = rng.randbytes(6 << 20)
    by_key = {f"doc-{i:07d}": rng.randrange(1 << 30) for i in range(rows)}
    arrays = [blob]

    def lookup(key):
        value = by_key[key]
        return f"{key} {value} {blob[value % len(blob)]}"

gc.collect()
# What pre-forking servers do (gunicorn's, uWSGI's apps): the boot's objects leave the
# collector's generations, so a collection during a request does not walk the heap.
gc.freeze()
key_digest = hashlib.sha256(repr(sorted(by_key.items())[:1000]).encode() + str(len(by_key)).encode()).hexdigest()
index_bytes = sum(len(memoryview(a).cast("B")) for a in arrays)


def checksum():
    h = hashlib.sha256(key_digest.encode())
    for a in arrays:
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/doc/"):
            key = self.path[len("/doc/"):]
            if key not in by_key:
                self.send_error(404)
                return
            body = f"{lookup(key)}\n".encode()
        else:
            body = f"{checksum()} {index_bytes} {len(by_key)}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("0.0.0.0", port), Handler)
print(f"ready in {time.time() - started:.2f} s: {index_bytes >> 20} MiB index, {len(by_key)} keys", flush=True)
server.serve_forever()
