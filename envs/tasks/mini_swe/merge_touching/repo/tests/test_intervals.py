import unittest

import intervals


class TestMerge(unittest.TestCase):
    def test_overlap(self):
        self.assertEqual(intervals.merge([(1, 4), (2, 6)]), [(1, 6)])
