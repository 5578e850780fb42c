"""Counts words: a streamparse bolt (streamparse's Bolt is pystorm's, with its conveniences)."""
from collections import Counter

from streamparse import Bolt


class WordCount(Bolt):
    outputs = ["word", "count"]

    def initialize(self, conf, ctx):
        self.counts = Counter()

    def process(self, tup):
        word = tup.values[0]
        self.counts[word] += 1
        self.emit([word, self.counts[word]])


if __name__ == "__main__":
    WordCount().run()
