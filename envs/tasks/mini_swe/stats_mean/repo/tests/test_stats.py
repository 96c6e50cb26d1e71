import unittest

import stats


class TestStats(unittest.TestCase):
    def test_empty(self):
        with self.assertRaises(ValueError):
            stats.mean([])
