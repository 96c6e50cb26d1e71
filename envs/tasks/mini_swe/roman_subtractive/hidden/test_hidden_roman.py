import unittest

import roman


class TestHidden(unittest.TestCase):
    def test_subtractive(self):
        self.assertEqual(roman.to_roman(4), "IV")
        self.assertEqual(roman.to_roman(1994), "MCMXCIV")
        self.assertEqual(roman.to_roman(3999), "MMMCMXCIX")

    def test_range(self):
        with self.assertRaises(ValueError):
            roman.to_roman(0)
