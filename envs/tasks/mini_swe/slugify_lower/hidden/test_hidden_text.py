import unittest

import text


class TestHidden(unittest.TestCase):
    def test_lower(self):
        self.assertEqual(text.slugify("Hello World"), "hello-world")
        self.assertEqual(text.slugify("RL  for Agents!"), "rl-for-agents")

    def test_separators(self):
        self.assertEqual(text.slugify("a, b;c"), "a-b-c")
