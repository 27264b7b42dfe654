"""The course book's Sphinx extension: loads the link, chapter, course-map, results and appendix helpers
beside it."""

import course_chapters
import course_links
import course_map
import course_recipes
import course_results


def setup(app):
    course_links.setup(app)
    course_chapters.setup(app)
    course_map.setup(app)
    course_results.setup(app)
    course_recipes.setup(app)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
