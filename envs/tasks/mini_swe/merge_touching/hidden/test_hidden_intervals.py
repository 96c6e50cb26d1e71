import unittest

import intervals


class TestHidden(unittest.TestCase):
    def test_touching(self):
        self.assertEqual(intervals.merge([(3, 5), (1, 3)]), [(1, 5)])

    def test_disjoint(self):
        self.assertEqual(intervals.merge([(1, 2), (4, 5)]), [(1, 2), (4, 5)])

    def test_overlap(self):
        self.assertEqual(intervals.merge([(1, 4), (2, 6), (5, 9)]), [(1, 9)])
