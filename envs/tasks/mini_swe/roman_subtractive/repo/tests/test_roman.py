import unittest

import roman


class TestRoman(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(roman.to_roman(3), "III")
