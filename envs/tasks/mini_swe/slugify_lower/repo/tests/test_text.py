import unittest

import text


class TestSlugify(unittest.TestCase):
    def test_separators(self):
        self.assertEqual(text.slugify("a, b;c"), "a-b-c")
