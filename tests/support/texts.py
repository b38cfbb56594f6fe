"""Evaluation texts for logits comparisons and prompts for greedy generation.

All texts were written for this project.  Each long text tokenizes to 256+
tokens with SmolLM2's tokenizer (checked in tests/test_reference_forward.py).
"""
from __future__ import annotations

STORY = """\
The lighthouse keeper on Gull Point had not spoken to another person in eleven days when the \
boat appeared. It came out of the fog just after dawn, a small green dinghy with one oar missing, \
turning slow circles in the tide. Marta watched it from the gallery rail with her coffee going \
cold in her hands. At first she thought it was empty. Then a hand lifted over the side, pale and \
thin, and waved once before it dropped again.

She ran down the ninety-two steps without counting them, which was the first time in six years \
she had not counted. The rocks at the bottom were slick with weed, and the water was so cold it \
made her teeth ache through her boots. She waded out until the sea reached her waist, caught the \
bow line, and hauled the dinghy toward the jetty.

Inside was a boy of perhaps twelve, wrapped in a yellow raincoat three sizes too large. He had a \
canvas bag clutched against his chest and a cut above one eyebrow that had already stopped \
bleeding. When she asked him his name, he shook his head. When she asked where he had come from, \
he pointed north, toward the open water where there was nothing at all for two hundred miles.

She carried him up to the kitchen, lit the stove, and wrapped him in the wool blanket her mother \
had knitted the winter before she died. The boy drank two cups of sweet tea and ate half a loaf \
of bread with butter. Only then did he open the canvas bag and set its contents on the table: a \
brass compass, a folded chart of a coastline Marta did not recognise, and a letter addressed, in \
careful blue ink, to the keeper of the Gull Point light.
"""

TECHNICAL = """\
A write-ahead log makes a storage engine durable without forcing every page to disk on every \
commit. The idea is simple: before a change is applied to the main data file, a record describing \
the change is appended to a sequential log and flushed. If the process crashes, the engine replays \
the log on restart and reaches the same state it would have reached without the crash.

Appending is cheap because the disk head, or the flash translation layer, sees one long sequential \
stream instead of scattered random writes. The expensive part is the flush. A call to fsync on a \
consumer SSD can take anywhere from a few hundred microseconds to several milliseconds, so engines \
batch commits: several transactions share one flush, a technique usually called group commit. The \
latency of each transaction rises slightly, but throughput can improve by an order of magnitude.

The log cannot grow forever. Periodically the engine writes a checkpoint, which records that every \
change up to some log sequence number has reached the data file. Log segments older than the \
checkpoint can then be recycled. Choosing the checkpoint interval is a trade-off: frequent \
checkpoints shorten recovery time but add background write traffic, while rare checkpoints keep \
the steady state fast and make recovery slow.

Two details are easy to get wrong. First, a torn write, where only part of a page reaches the disk \
during a power failure, can corrupt a page that the log assumes is intact; engines defend against \
this with checksums on every page and, in some designs, by logging the full image of a page the \
first time it changes after a checkpoint. Second, the order of operations matters: the log record \
must be durable before the modified page is written, never after, or recovery may see a page that \
reflects a change the log has never heard of.
"""

DIALOGUE_CODE = """\
Priya: Can you look at this function? It is supposed to return the running average, but the \
numbers drift after a few thousand samples.

Sam: Sure, paste it here.

Priya: Here it is.

```python
class RunningMean:
    def __init__(self):
        self.count = 0
        self.mean = 0.0

    def add(self, x: float) -> float:
        self.count += 1
        self.mean = self.mean + (x - self.mean) / self.count
        return self.mean
```

Sam: That update is actually the stable one. The drift you see probably comes from somewhere \
else. What type are the samples?

Priya: They come from the sensor as 16-bit integers, and I convert them with numpy before \
calling add.

Sam: Then check whether the conversion is to float16. If you do np.asarray(raw, dtype=np.float16) \
the values above 2048 lose their last bits, and the error accumulates in a way that looks like \
drift.

Priya: Oh. That is exactly what the loader does. So I should change it to float32?

Sam: Use float64 for the accumulator and keep the raw integers as they are. Something like this:

```python
def mean_of(samples: list[int]) -> float:
    acc = RunningMean()
    for s in samples:
        acc.add(float(s))
    return acc.mean
```

Priya: And if I want the variance as well?

Sam: Keep a second accumulator, m2, and update it with (x - old_mean) * (x - new_mean). \
The variance is m2 / (count - 1) once you have at least two samples. It is Welford's method, and \
it has the same nice numerical behaviour as the mean update you already wrote.

Priya: Great, I will add a test with a million samples and compare against numpy.var.
"""

TEXTS = {"story": STORY, "technical": TECHNICAL, "dialogue_code": DIALOGUE_CODE}

# Short prompts for greedy-generation comparisons (32 tokens each).
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here are three tips for staying healthy:\n1.",
    "Water boils at 100 degrees Celsius because",
]
