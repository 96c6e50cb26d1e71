import unittest

from stack import Stack


class TestStack(unittest.TestCase):
    def test_len(self):
        s = Stack()
        s.push(1)
        self.assertEqual(len(s), 1)
