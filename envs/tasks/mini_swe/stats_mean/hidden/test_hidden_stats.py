import unittest

import stats


class TestHidden(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(stats.mean([2, 4, 6]), 4.0)
        self.assertEqual(stats.mean([5]), 5.0)

    def test_variance(self):
        self.assertAlmostEqual(stats.variance([1, 2, 3, 4]), 1.25)

    def test_empty(self):
        with self.assertRaises(ValueError):
            stats.mean([])
