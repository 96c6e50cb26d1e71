import unittest

from stack import Stack


class TestHidden(unittest.TestCase):
    def test_lifo(self):
        s = Stack()
        for i in (1, 2, 3):
            s.push(i)
        self.assertEqual([s.pop(), s.pop(), s.pop()], [3, 2, 1])

    def test_empty(self):
        with self.assertRaises(IndexError):
            Stack().pop()
