"""Splits sentences into words: a pystorm bolt, as it would run under Storm's ShellBolt."""
from pystorm import Bolt


class SplitSentence(Bolt):
    # pystorm anchors emits to the current tuple and acks it after process() returns.
    auto_anchor = True
    auto_ack = True
    auto_fail = True

    def process(self, tup):
        for word in tup.values[0].split(" "):
            if word:
                self.emit([word])


if __name__ == "__main__":
    SplitSentence().run()
